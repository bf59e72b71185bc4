// create_write DIR N SIZE: creates DIR and N files of SIZE bytes in it (open O_CREAT|O_TRUNC, write,
// close), timing the three calls separately. Build: gcc -O2 -o create_write create_write.c
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){int n=atoi(argv[2]),sz=atoi(argv[3]);char*buf=calloc(1,sz);mkdir(argv[1],0755);
 double to=0,tw=0,tc=0;char p[512];
 for(int i=0;i<n;i++){snprintf(p,512,"%s/f%05d",argv[1],i);double a=now();int fd=open(p,O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC,0644);double b=now();if(write(fd,buf,sz)!=sz)return 1;double c=now();close(fd);double d=now();to+=b-a;tw+=c-b;tc+=d-c;}
 printf("per file: open %.1f us, write %.1f us, close %.1f us, total %.1f us\n",to/n*1e6,tw/n*1e6,tc/n*1e6,(to+tw+tc)/n*1e6);}
